"""`eroica policy replay STEP_TIMES_FILE [--policy FILE]` and `eroica policy show`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml
from pydantic import ValidationError

from eroica.collector.policy import TriggerPolicy, first_error
from eroica.collector.replay import read_step_times, replay


def add_arguments(p: argparse.ArgumentParser) -> None:
    s = p.add_subparsers(dest="policy_cmd", required=True, metavar="{replay,show}")
    r = s.add_parser("replay", help="when would windows open on this step-time history?")
    r.add_argument("step_times", type=Path, help="one step time (s) per line, step,seconds CSV, or a JSON list")
    r.add_argument("--policy", type=Path, help="a YAML/JSON file of TriggerPolicy fields (others: defaults)")
    r.set_defaults(func=run_replay)
    sh = s.add_parser("show", help="the policy's fields, defaults and meaning")
    sh.add_argument("--policy", type=Path, help="a YAML/JSON file of TriggerPolicy fields to show with the defaults "
                    "(default: the defaults and EROICA_POLICY_* of this environment)")
    sh.add_argument("--format", choices=("text", "json"), default="text",
                    help="text: each field with its meaning; json: the fields as a --policy file takes them "
                         "(default: %(default)s)")
    sh.set_defaults(func=run_show)


def load_policy(path: Path | None) -> TriggerPolicy:
    """The policy of a YAML/JSON file, or of the environment's EROICA_POLICY_* (each unknown one said on
    stderr: a misspelt variable would otherwise change nothing, silently)."""
    for line in TriggerPolicy.unknown_env():
        print(f"eroica: ignored: {line}", file=sys.stderr)
    if path is None:
        return TriggerPolicy.from_env()
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise ValueError(f"{path}{where}: not YAML ({getattr(exc, 'problem', None) or exc}): a mapping of policy "
                         "fields is expected (`eroica policy show` lists them)") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a mapping of policy fields was expected")
    try:
        return TriggerPolicy.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        if err["type"] == "extra_forbidden":
            raise ValueError(f"{path}: {'.'.join(map(str, err['loc']))} is not a policy field (`eroica policy show` "
                             "lists them)") from exc
        raise ValueError(f"{path}: {first_error(exc)}") from exc


def run_replay(args: argparse.Namespace) -> int:
    try:
        policy = load_policy(args.policy)
        steps = read_step_times(args.step_times)
    except (OSError, ValueError) as exc:
        print(f"eroica policy replay: {exc}", file=sys.stderr)
        return 2
    wins = replay(steps, policy)
    for i, w in enumerate(wins):
        print(f"window {i}: detector fired at step {w.fired_at_step} ({w.reason}); profiles steps "
              f"{w.start_step}-{w.end_step - 1}; opens at {w.at_seconds:.1f} s"
              + ("; quiet: the job ran at speed while profiled (not counted; the detector backs off)"
                 if w.quiet else ""))
    print(f"{len(wins)} window(s) over {len(steps)} steps ({sum(steps) / 3600:.2f} h of training), "
          f"{sum(w.quiet for w in wins)} quiet; profiled {sum(w.end_step - w.start_step for w in wins)} steps")
    return 0


def run_show(args: argparse.Namespace) -> int:
    try:
        policy = load_policy(args.policy)
    except (OSError, ValueError) as exc:
        print(f"eroica policy show: {exc}", file=sys.stderr)
        return 2
    if args.format == "json":          # what a file given to --policy holds, every field
        print(json.dumps(policy.model_dump(mode="json"), indent=2))
        return 0
    for name, field in TriggerPolicy.model_fields.items():
        print(f"{name} = {json.dumps(getattr(policy, name))}    # {field.description or ''}".rstrip(" #"))
    return 0
