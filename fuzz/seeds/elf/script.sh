#!/bin/sh
exec /app "$@"
