"""One module per `attn-dispatch` command; see `dispatcher.cli`."""
