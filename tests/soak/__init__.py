"""The soak test: many TLS watches on one slice for minutes, vwserver measured from outside."""
