"""The controller process (`castslice control`): leader election, work queue, reconcilers."""
