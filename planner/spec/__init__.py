"""What the user asks for, validated once: the model, the job (precision, recipe, measures),
the layout and the rules a layout must keep. Nothing here costs anything."""
