#!/bin/bash
# Print the number of non-empty lines in the file given as the only argument.
if [ $# -ne 1 ] then
    echo "usage: count_lines.sh FILE" >&2
    exit 2
fi
grep -c . "$2"
