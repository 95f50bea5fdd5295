"""One module per pipeline stage; each `run()` takes its inputs and params and writes its outputs."""
