"""The sandbox a slot's command runs in, and who it runs as.

`bubblewrap` builds it (mounts, namespaces, limits joined) and runs one command in it;
`syscall_filter` is the seccomp filter that refuses setuid bits; `launcher` keeps a resident
launcher per slot (`resident` is the program it runs inside the sandbox) so a one-shot command
costs a bash, not a sandbox; `uids` claims slot uids no two servers of a host share; `reaper`
adopts and reaps the sandboxes' orphans.
"""
