fail() { echo "FAIL: $*"; exit 1; }
[ -f palindrome.py ] || fail "palindrome.py is missing"
out=$(printf 'A man, a plan, a canal: Panama\nhello\nNo lemon, no melon\nab\nx\n' | python3 -s palindrome.py 2>&1) || fail "palindrome.py failed: $out"
[ "$out" = "$(printf 'yes\nno\nyes\nno\nyes')" ] || fail "wrong answers: $(echo $out)"
w=$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')
r=''; for ((i = ${#w} - 1; i >= 0; i--)); do r+=${w:i:1}; done
out=$(printf '%s%s\n%sz\n' "$w" "$r" "$w" | python3 -s palindrome.py 2>&1)
[ "$out" = "$(printf 'yes\nno')" ] || fail "wrong answers for unseen lines: $(echo $out)"
echo OK
