"""Talking to web servers safely: fetching, address checks, robots.txt, link scope."""
