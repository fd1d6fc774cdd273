"""Reaching hosts: the Connection interface, SSH and local connections, host keys, and the
fleet runner that gives every host exactly one outcome within its budget."""
