"""What a call does in a slot.

`execution` runs a slot's operations at most once per call id (results stored for retries);
`operations` turns the four operations (exec, read_file, write_file, search) into tool outputs;
`sessions` is the stateful terminal; `transfer` streams files and folders in and out.
"""
