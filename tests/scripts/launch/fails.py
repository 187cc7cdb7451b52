"""A script whose last rank fails at start while the others wait for it, as a crashed rank
leaves its peers in a collective: the launcher must count the attempt as failed."""

import argparse
import os
import time

parser = argparse.ArgumentParser()
parser.add_argument("--pai_load_folder", default=None)
parser.parse_args()
if int(os.environ.get("RANK", "0")) == int(os.environ.get("WORLD_SIZE", "1")) - 1:
    raise RuntimeError("deliberate failure (the last rank)")
time.sleep(120)  # torchrun stops this rank once its peer has failed
