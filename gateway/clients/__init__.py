"""Client tools shipped with the gateway: `gateway bench`, `gateway batch`, key files.

Nothing here is imported by the server; they import only the shared vocabulary below it.
"""
