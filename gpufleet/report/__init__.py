"""Reports: terminal, JSON, JUnit XML and Prometheus textfile."""
