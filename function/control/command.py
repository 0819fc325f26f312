"""``castslice control``: the program (its arguments are declared in function/cli.py; the process
is in process.py)."""

from __future__ import annotations

import argparse
import os
import sys

from function.contract import CONTROL_LEASE_NAME as DEFAULT_LEASE_NAME
from function.contract import EXIT_BAD_INPUT, LEASE_SECONDS, RETRY_SECONDS
from function.contract import RENEW_DEADLINE_SECONDS as RENEW_DEADLINE

__all__ = ["DEFAULT_LEASE_NAME", "LEASE_SECONDS", "RENEW_DEADLINE", "RETRY_SECONDS", "run"]


def run(args: argparse.Namespace) -> int:
    from function.config_file import load_config, load_config_file
    from function.control.process import ControlSettings, own_identity, own_namespace, run_control
    from function.core.config import ConfigError
    from function.kube.credentials import NoCredentials
    from function.logs import configure_logging

    configure_logging()
    try:
        config = load_config_file(args.config) if args.config else load_config()
    except ConfigError as error:
        print(error, file=sys.stderr)
        return EXIT_BAD_INPUT
    settings = ControlSettings(
        lease_name=args.lease_name,
        lease_namespace=args.lease_namespace or own_namespace(os.environ),
        identity=args.identity or own_identity(os.environ),
        lease_seconds=args.lease_duration,
        renew_deadline=args.renew_deadline,
        retry_seconds=args.retry_period,
        host=args.host,
        port=args.port,
    )
    try:
        return run_control(config, settings)
    except (NoCredentials, ValueError) as error:
        print(f"castslice control: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
