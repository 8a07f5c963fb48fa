"""The requests' guards: queue, bodies, payloads, sessions, memory admission, temporary files."""
