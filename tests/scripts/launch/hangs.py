"""A script whose ranks hang (sleep): the launcher's --attempt-timeout must stop them all."""

import argparse
import os
import time
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--pai_load_folder", default=None)
parser.add_argument("--pids", required=True)
args = parser.parse_args()
Path(args.pids).mkdir(parents=True, exist_ok=True)
(Path(args.pids) / f"rank{os.environ.get('RANK', '0')}.pid").write_text(str(os.getpid()))
time.sleep(600)
