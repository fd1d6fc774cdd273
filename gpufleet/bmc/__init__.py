"""The nodes' baseboard management controllers, reached from the controller."""
