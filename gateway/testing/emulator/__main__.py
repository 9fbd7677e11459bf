"""`python -m gateway.testing.emulator`."""

from gateway.testing.emulator.app import main

if __name__ == "__main__":
    main()
