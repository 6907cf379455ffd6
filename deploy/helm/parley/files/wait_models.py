"""Wait until the models Job has marked each part this pod reads as whole (files/fetch_models.py)."""

import sys
import time
from pathlib import Path

while missing := [mark for mark in sys.argv[1:] if not Path(mark).exists()]:
    print("waiting for the models Job:", ", ".join(missing), flush=True)
    time.sleep(10)
