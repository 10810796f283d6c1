def main():
    # TODO: parse arguments
    print('hello')
