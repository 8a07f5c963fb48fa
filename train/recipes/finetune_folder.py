"""Fine-tune the bundled model on a folder of your photos (one sub-folder per class) within a time budget.

For small sets (2-20 classes, tens to hundreds of images each), as the app's Train tab does
(``vit_core.finetune.finetune_folder``): 20% of each class held out, the images decoded once into memory, a new
zero-initialised head, SGD with momentum at a learning rate that runs on the clock (``budget_minutes``, 3 by
default: ``--minutes``), random resized crops and flips; afterwards the held-out images calibrate the temperature
and the "none of my classes" detector, and the run folder gets its model card. Give the folder with ``--data``
and another starting checkpoint with ``--init``.
"""

from pathlib import Path

from vit_core.finetune import FINETUNE_RECIPE

recipe = FINETUNE_RECIPE | dict(init=str(Path(__file__).resolve().parents[2] / "models" / "cifar10_speedrun"))
