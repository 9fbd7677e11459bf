"""The app-facing API: request bodies, routes and the streaming relay."""
