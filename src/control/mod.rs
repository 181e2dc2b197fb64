//! The control plane: triggers, query and stop over unix sockets.
