class User:
    pass  # TODO add fields
