"""The process: `gateway serve`, its workers, the door in front of uvicorn, logs."""
