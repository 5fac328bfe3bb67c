"""Text classification fine-tuning (GLUE and CLUE), as LiBai's projects/text_classification."""
