"""The models the app can offer, load and keep, and whose they are."""
