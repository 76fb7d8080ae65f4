"""The slot engine's defaults, free of TensorFlow: `tfgen serve --help` shows them."""

#: Tokens every running row gets per engine call (a new request waits at most that long to join the batch).
DEFAULT_STEPS_PER_CALL = 8
#: Rows waiting for a slot, per slot, unless the server says otherwise.
DEFAULT_QUEUE_PER_SLOT = 8
