"""Built-in model runners; each family lives in its own module (``rlx_lm.runners.llama``)."""
