"""Pure protocol code: tensors in, tensors (or actions to send) out. No I/O, no asyncio, no clock,
no global RNG; ``now`` and generators are parameters. Imports nothing of gossamer's but itself.
"""
