"""Facts about a host: every snippet composed into one round trip, parsed on the controller
by pure parsers; a fact without a value is absent with a reason."""
