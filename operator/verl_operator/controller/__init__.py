"""The kopf operator: indices, admission, the reconciler, status, events and metrics.

Only ``handlers`` registers kopf handlers; the other modules are plain code the handlers call.
"""
