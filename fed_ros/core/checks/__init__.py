"""Checks before use: every input the server or a robot judges gets one Decision (accept, or
reject with a stable code and a reason). A new check goes here; the audit log records them."""
