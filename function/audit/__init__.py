"""The audit trail: every admission decision as a CloudEvent, delivered off the admission path.

events.py builds the event (pure); sinks.py sends it (Knative K_SINK, Dapr, stdout); delivery.py
queues, retries and drains; metrics.py counts; recorder.py ties them to the webhook; consumer.py
is the reference subscriber (schema check, SQLite, queries for ``castslice audit``).
"""
