"""The `eroica` command: one sub-command group per module, above all four layers."""

from __future__ import annotations

import argparse
import sys

from eroica.cli import (
    control_cmd,
    demo,
    diagnose_cmd,
    draft_cmd,
    eval_cmd,
    findings_cmd,
    ingest_cmd,
    policy_cmd,
    record,
    rules_cmd,
    run_cmd,
    schema_cmd,
    serve_cmd,
    simulate,
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="eroica", description="Find why a distributed training job got slow.")
    sub = p.add_subparsers(dest="cmd", required=True)
    demo.add_parser(sub)
    diagnose_cmd.add_parser(sub)
    rules_cmd.add_parser(sub)
    record.add_parser(sub)
    eval_cmd.add_parser(sub)
    schema_cmd.add_parser(sub)
    draft_cmd.add_parser(sub)
    ingest_cmd.add_parser(sub)
    simulate.add_parser(sub)
    policy_cmd.add_parser(sub)
    control_cmd.add_parser(sub)
    serve_cmd.add_parser(sub)
    findings_cmd.add_parser(sub)
    run_cmd.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
