"""`nightbatch doctor`: the check a user runs right after `cdk deploy` (or against `nightbatch local`).

Before the first deploy (`--template`) it checks only what the account must have (prerequisites.py). After it,
it checks the key, lists the models, runs a one-line batch per model and endpoint and prints when each phase
was reached — validate, the AWS Batch job's RUNNABLE → STARTING → RUNNING (with --stack), model loaded, first
result, finalize, notification — and, for a phase that stalls, the specific remedy.

`api.py` is what the OpenAI SDK sees, `aws.py` what the account shows (through `nightbatch.aws.account`),
`webhook.py` the notification as a webhook subscriber sees it (without --stack), `run.py` polls them together,
`report.py` holds the findings, `remedies.py` what to do about them and `render.py` prints them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

DEFAULT_TIMEOUT = 1800.0  # a first GPU job on a new deployment: instance launch, ~10 GB image pull, weights
DEFAULT_STALL = 300.0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser],
             server: argparse.ArgumentParser) -> None:
    p = sub.add_parser("doctor", parents=[server], help="check a deployment end to end, phase by phase",
                       description="Check the key, list the models, run a one-line batch per model and endpoint, "
                                   "and print the time of each phase with a remedy for any that stalls.")
    p.add_argument("--stack", metavar="NAME", help="the CloudFormation stack (e.g. nightbatch-prod): read its "
                   "outputs, the AWS Batch jobs and the Step Functions execution with your AWS credentials")
    p.add_argument("--template", metavar="PATH", help="before the first deploy: check only what the account must "
                   "have for the stack `cdk synth` wrote here (e.g. cdk.out/nightbatch-prod.template.json): the "
                   "Lambda concurrency quota against what it reserves, GPU and SageMaker quotas, the Spot role; no "
                   "API key, no probe batch")
    p.add_argument("--region", help="the stack's region (default: AWS_REGION / your AWS profile's)")
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                   help=f"give up on a probe batch after this long (default {DEFAULT_TIMEOUT:.0f})")
    p.add_argument("--stall-after", type=float, default=DEFAULT_STALL, metavar="SECONDS",
                   help=f"say why a phase is stuck after this long without progress (default {DEFAULT_STALL:.0f})")
    p.add_argument("--poll-interval", type=float, default=2.0, metavar="SECONDS", help="default 2")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    import openai

    from nightbatch.aws.account import AccountReadError
    from nightbatch.cli.connection import CommandError, connect, explain, resolve_target
    from nightbatch.cli.doctor.render import render
    from nightbatch.cli.doctor.report import Report
    from nightbatch.cli.doctor.run import Doctor, Watcher
    from nightbatch.cli.doctor.webhook import WebhookWatcher

    try:
        if args.template:
            return _before_deploy(args)
        watchers: list[Watcher] = []
        base_url = args.base_url
        if args.stack:
            from nightbatch.cli.doctor.aws import StackWatcher
            from nightbatch.cli.doctor.sagemaker import SageMakerWatcher

            stack = StackWatcher.open(args.stack, region=args.region)
            base_url = base_url or stack.outputs.get("ApiUrl")
            # SageMaker first: its jobs reach the job phases before the Batch watcher skips the unseen ones.
            watchers += [SageMakerWatcher(stack.account, stack.outputs, args.stack), stack]
            secret = stack.outputs.get("ApiKeysSecret")
            if not (args.api_key or os.environ.get("NIGHTBATCH_API_KEY")) and secret:
                raise CommandError(f"no API key given: pass --api-key; the stack's first key is in {secret} "
                                   f"(`aws secretsmanager get-secret-value --secret-id {secret} --query "
                                   "SecretString --output text`)")
        target = resolve_target(base_url, args.api_key)
        client = connect(target)
        if not args.stack:
            watchers.append(WebhookWatcher(client, target.base_url))
        report = Report(base_url=target.base_url, stack=args.stack)
        doctor = Doctor(client, report, watchers, timeout=args.timeout, stall_after=args.stall_after,
                        poll=args.poll_interval, progress=sys.stderr)
        doctor.say(f"nightbatch doctor: checking {target.base_url}")
        try:
            doctor.run()
        finally:
            for w in watchers:
                w.close()
    except (CommandError, AccountReadError, openai.OpenAIError, OSError) as e:
        print(f"nightbatch doctor: error: {explain(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    print(json.dumps(report.to_json(), indent=2) if args.json else render(report))
    return 0 if report.passed else 1


def _before_deploy(args: argparse.Namespace) -> int:
    from pathlib import Path

    from nightbatch.aws.account import AwsAccount
    from nightbatch.cli.doctor.prerequisites import check_template
    from nightbatch.cli.doctor.render import render
    from nightbatch.cli.doctor.report import Report

    report = Report(base_url="before the first deploy", stack=args.template)
    check_template(report, AwsAccount.connect(args.region), Path(args.template))
    print(json.dumps(report.to_json(), indent=2) if args.json else render(report))
    return 0 if report.passed else 1
