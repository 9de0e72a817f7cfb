"""Classify a folder of images: ``python scripts/predict.py model=outputs/run/checkpoints/best.pt images=my_scenes/``.

The same as the ``rsnet-predict`` command (the code, and every option, is in rsnet/commands/predict.py).
"""

import sys

from rsnet.commands.predict import main

if __name__ == "__main__":
    sys.exit(main())
