"""PipeFusion's layer pipeline: the repeated blocks cut into stages over the pp axis, activations sent stage to
stage point to point, the prediction returned from the last stage (`stages`)."""
