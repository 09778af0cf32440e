"""Drop-in replacements for other libraries' buffers (torchgfn, torchrl)."""
