#!/bin/bash
# The reference solution (solution/turns.json, the tool calls the demo policy plays) as one script.
cd /workspace || exit 1
cat > fizzbuzz.sh <<'__SOLUTION__'
#!/bin/bash
# Print FizzBuzz from 1 to N.
n=${1:?usage: fizzbuzz.sh N}
for ((i = 1; i <= n; i++)); do
    if ((i % 15 == 0)); then echo FizzBuzz
    elif ((i % 3 == 0)); then echo Fizz
    elif ((i % 5 == 0)); then echo Buzz
    else echo "$i"
    fi
done
__SOLUTION__
(
cd /workspace
chmod +x fizzbuzz.sh && ./fizzbuzz.sh 15
)
