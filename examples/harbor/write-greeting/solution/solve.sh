#!/bin/bash
cd /workspace
echo 'hello, harbor' > greeting.txt
printf '#!/bin/sh\ncat "$(dirname "$0")/greeting.txt"\n' > greeting.sh
chmod +x greeting.sh
./greeting.sh
