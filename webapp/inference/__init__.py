"""An uploaded image through a model: reading, decoding, the analysis and its maps, the words."""
