"""One module per model family: spec reading, denoise hooks, blocks and attention streams, sequence-parallel plans, VAE decode rules and planner shape facts."""
