"""The local lab cluster: nodes in network namespaces with their own sshd, a stand-in apt
repository, and Slurm on demand."""
