"""Stock ExecuTorch against edgefuse, measured: the report of every norm, programs lowered both ways and
checked against eager in the runtime, QNN's two flows on its emulator, and the delegate map."""
