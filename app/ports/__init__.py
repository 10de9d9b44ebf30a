"""The ports the leader's use cases are written against: Telegram, the store and the bus.

Each is a ``typing.Protocol``; the adapters implement them (``bot/gateway.TelegramGateway``,
``storage/store.SqliteStore``, ``bus/follower_socket.FollowerSocket``; the bus server calls the
leader through ``LeaderBus``) and the composition root (``leader/assembly.py``,
``leader/process.py``) picks them. A port imports nothing of topicbus but the core and the bus protocol.
"""
