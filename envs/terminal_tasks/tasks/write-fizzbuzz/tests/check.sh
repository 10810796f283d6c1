fail() { echo "FAIL: $*"; exit 1; }
[ -f fizzbuzz.sh ] || fail "fizzbuzz.sh is missing"
[ -x fizzbuzz.sh ] || fail "fizzbuzz.sh is not executable"
[ "$(./fizzbuzz.sh 1)" = "1" ] || fail "wrong output for N=1"
want=$(python3 -I -c 'print("\n".join("FizzBuzz" if i % 15 == 0 else "Fizz" if i % 3 == 0 else "Buzz" if i % 5 == 0 else str(i) for i in range(1, 32)))')
[ "$(./fizzbuzz.sh 31)" = "$want" ] || fail "wrong output for N=31"
echo OK
