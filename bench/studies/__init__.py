"""The studies behind docs/results.md and the topic pages."""
