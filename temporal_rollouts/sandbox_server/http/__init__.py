"""The sandbox server over HTTP, and what every HTTP server of the project shares.

`app` wraps the slot manager in Starlette routes and starts the server; `hosts` answers only
to the server's own names (DNS rebinding); `keys` is the bearer key a server asks for beyond
loopback. The policy servers import `hosts` and `keys` too.
"""
