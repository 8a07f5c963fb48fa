"""The Train tab's jobs: a zip to a training folder, the training process, its result page."""
