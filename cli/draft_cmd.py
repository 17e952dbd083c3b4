"""`eroica draft DIAGNOSIS.json [--repo PATH] [--backend offline|openai] [--verify CMD] -o OUT_DIR`."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

from eroica.assistant.backends import ModelSettings
from eroica.assistant.draft import Options, draft_all, load_diagnosis, write_outcomes
from eroica.assistant.redact import Redactor, load_pattern_file
from eroica.assistant.verify import DetectorSteps, Runner, link_verified, verify_all


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("diagnosis", type=Path, help="an eroica.diagnosis/v1 JSON file (eroica diagnose --format json)")
    p.add_argument("--repo", type=Path, help="the training code's repository (drafted diffs must apply to it)")
    p.add_argument("--backend", choices=("offline", "openai"), default="offline",
                   help="offline: deterministic drafts from the remediation templates; openai: drafts by an "
                        "OpenAI-compatible model endpoint (default: %(default)s)")
    p.add_argument("--base-url", help="openai backend: the endpoint (or EROICA_LLM_BASE_URL)")
    p.add_argument("--model", help="openai backend: the model name (or EROICA_LLM_MODEL)")
    p.add_argument("--redact", action="append", default=[], help="a regular expression never sent to a model")
    p.add_argument("--redact-file", type=Path, help="a file of such expressions, one per line; blank lines and # "
                   "comments skipped (or EROICA_REDACT_FILE)")
    p.add_argument("--validate", help="the repository's validation command, run by the gate on each drafted diff in "
                                      "a scratch copy (default: [tool.eroica] validate in the repo's pyproject.toml)")
    p.add_argument("--validate-timeout", type=float, default=300.0,
                   help="seconds the validation command may run on each drafted diff (default 300)")
    p.add_argument("--unsandboxed-validation", action="store_true",
                   help="run the validation command even where no sandbox (bubblewrap) can: it then runs the "
                        "draft and the repository's tests with your files and network (the change request says so)")
    p.add_argument("--verify", metavar="CMD",
                   help="the command that reproduces the slow run (e.g. 'torchrun --nproc-per-node 4 train.py'): it "
                        "runs in a scratch copy of --repo, unchanged and with each code draft applied, attached by "
                        "eroica, and each change request says what the re-runs measured. It is your job, run as "
                        "given (not sandboxed)")
    p.add_argument("--verify-timeout", type=float, default=900.0, help="seconds each re-run may take (default 900)")
    p.add_argument("--verify-window-step", type=int, default=40,
                   help="the step the re-runs measure from: a window of the policy's length is forced there "
                        "(default 40; after the command's warm-up and the slowdown's onset)")
    p.add_argument("--verify-runs", type=int, default=3,
                   help="how many times the command runs unchanged and with each draft, in rounds; each side's "
                        "median run is judged (default 3: re-runs of one job on a shared host differ by 10-15%%)")
    p.add_argument("--link", metavar="SERVICE_URL",
                   help="with --verify: link each verified change request to its finding's issue in this eroica "
                        "serve (token from EROICA_SINK_TOKEN)")
    p.add_argument("--job", help="with --link: the job's id in the service (GET /v1/jobs: <name>.<run>)")
    p.add_argument("-o", "--output", type=Path, required=True, help="directory for the change requests")
    p.set_defaults(func=run)


def runner(window_step: int) -> Runner:
    """Runs a reproduction command as `eroica run` would, a window forced at `window_step`; the whole
    process group ends at the time limit."""
    from eroica.cli.run_cmd import attach_env
    from eroica.collector.monitor import FORCE_ENV

    def run_one(command: str, cwd: Path, out: Path, timeout: float) -> str | None:
        ns = argparse.Namespace(out=out, sink=None, job=None, step=None, policy=None)
        env = {**attach_env(ns, dict(os.environ)), FORCE_ENV: str(window_step)}
        log = out.parent / f"{out.name}.log"
        with log.open("wb") as sink:
            p = subprocess.Popen(["bash", "-c", command], cwd=cwd, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                 start_new_session=True)
            try:
                rc = p.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                return f"timed out after {timeout:.0f} s"
        if rc != 0:
            tail = log.read_bytes()[-300:].decode(errors="replace").strip().splitlines()
            return f"exit {rc}: {tail[-1] if tail else 'no output'}"
        return None
    return run_one


def run(args: argparse.Namespace) -> int:
    try:
        d = load_diagnosis(args.diagnosis)
        settings = ModelSettings.from_env(args.base_url, args.model) if args.backend == "openai" else None
    except ValueError as exc:
        print(f"eroica draft: {exc}")
        return 2
    if args.repo is not None and not args.repo.is_dir():
        print(f"eroica draft: --repo {args.repo}: not a directory")
        return 2
    try:
        patterns = [*args.redact, *(load_pattern_file(args.redact_file) if args.redact_file else [])]
        Redactor.for_site([], patterns)   # --redact and EROICA_REDACT_FILE too, before anything is written
    except ValueError as exc:
        print(f"eroica draft: {exc}")
        return 2
    if args.verify and args.repo is None:
        print("eroica draft: --verify needs --repo (the code the command runs)")
        return 2
    if args.verify_runs < 1:
        print(f"eroica draft: --verify-runs {args.verify_runs}: at least 1")
        return 2
    if args.link and not (args.verify and args.job):
        print("eroica draft: --link needs --verify (only verified change requests are linked) and --job")
        return 2
    outcomes = draft_all(d, args.output, options=Options(
        repo=args.repo, backend=args.backend, settings=settings, redact_patterns=patterns, validate=args.validate,
        validate_timeout_seconds=args.validate_timeout, sandboxed_validation=not args.unsandboxed_validation))
    if args.verify:
        from eroica.collector.policy import TriggerPolicy
        policy = TriggerPolicy.from_env()        # the re-runs' detector: they inherit this environment
        outcomes = verify_all(d, outcomes, args.repo, args.verify, runner(args.verify_window_step),
                              args.verify_timeout, runs=args.verify_runs,
                              detector=DetectorSteps(policy.warmup_steps, policy.baseline_steps, policy.recent_steps,
                                                     policy.lead_steps),
                              progress=lambda s: print(f"eroica draft: {s}", file=sys.stderr, flush=True))
        write_outcomes(args.output, outcomes)
        if args.link:
            for line in link_verified(outcomes, args.link, args.job, os.environ.get("EROICA_SINK_TOKEN")):
                print(f"eroica draft: {line}")
    for o in outcomes:
        why = f" ({o.refusal})" if o.refusal else ""
        where = f" at {o.target}" if o.target and o.kind == "code" else ""
        v = o.verification
        checked = "" if v is None else f"; {'verified' if v.verified else 'NOT verified'}: {v.summary}"
        print(f"{o.kind:7s} {o.finding}{where}: {o.directory}{why}{checked}")
    if not outcomes:
        print("no finding at >= 0.5 confidence: nothing to draft")
    print(f"nothing was applied; review the change requests under {args.output}")
    return 0
