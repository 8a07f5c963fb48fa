"""Fine-tune the mpp_pretrain checkpoint on 5,000 labelled CIFAR-10 images (compare: mpp_scratch_baseline).

Run mpp_pretrain first (into runs/mpp_pretrain). Same data, schedule and budget as the baseline; only the
starting weights differ. The head is new and zero-initialised (paper section 3.2).
"""

from train import load_recipe

# The baseline's data, schedule and budget exactly; only the starting weights differ (the model is the checkpoint's).
recipe = {k: v for k, v in load_recipe("mpp_scratch_baseline").items() if k != "model_args"}
recipe["init"] = "runs/mpp_pretrain"
