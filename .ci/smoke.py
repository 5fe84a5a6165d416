"""Print the machine and the bundled model's greedy and seeded tokens, for cross-machine checks.

The seeded draw is specified to give the same tokens on every machine (the x86-64 builds
and AArch64 both use fused multiply-add), so the output must match byte for byte.
"""

import platform

import rlx_lm

runner, tokenizer = rlx_lm.load_default()
greedy = rlx_lm.generate(runner, tokenizer, "Mr. Darcy", max_tokens=24)
opts = rlx_lm.SampleOpts(temperature=0.8, top_k=40, top_p=0.9, min_p=0.05, seed=7)
seeded = rlx_lm.generate(runner, tokenizer, "Mr. Darcy", max_tokens=24, opts=opts)
print(platform.machine(), list(greedy.tokens), list(seeded.tokens))
