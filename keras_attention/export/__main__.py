"""`keras-attention check PATH [--list-ops] [--verbose N]`

Also `python -m keras_attention.export check PATH`. Both start without
TensorFlow's log block (keras_attention/_quiet.py).

Exit status 0 when TF Serving can load and run the SavedModel at PATH, 1 when
the check found problems, 2 when PATH is not a SavedModel.
"""

import argparse
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="keras-attention",
        description="Checks a SavedModel before deploying it to TF Serving.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="verify that TF Serving can serve PATH")
    check.add_argument("path")
    check.add_argument("--list-ops", action="store_true", help="also list the TensorFlow core ops")
    check.add_argument(
        "--verbose",
        type=int,
        choices=(0, 1, 2),
        default=1,
        help="0 silent, 1 a progress bar (default), 2 one line when done",
    )
    args = parser.parse_args(argv)

    from keras_attention.export.check import NotASavedModelError
    from keras_attention.export.check import check_servable

    try:
        report = check_servable(args.path, verbose=args.verbose)
    except NotASavedModelError as error:
        print(error, file=sys.stderr)
        return 2
    print(report.summary(list_ops=args.list_ops))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
