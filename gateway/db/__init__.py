"""The gateway's database: its tables (`tables`) and the migrations that create and upgrade them."""
