"""The real engine: a release's own environment with its CPU adaptations, a local model, real servers.

``environment`` builds and verifies the engine environment (``pins`` says what it holds),
``adaptations`` holds the CPU codemods, ``model`` the locally built model, ``launch`` starts one
real sglang server or the mini load balancer and stops its whole process tree.
"""
