"""The lake console: a web page served by the kit on 127.0.0.1 with a token (`console` starts it, `down` stops it).

- `gate`: the token gate every HTTP request and websocket passes (the token, or the cookie set after the first visit)
- `backend`: the server's one connection to the worker plane and one to the lake, used from the pages' threads
- `shapes`: how an answer is drawn (a table's cells, a chart chosen by the columns' types)
- `pages`: the Query and Lake pages (NiceGUI: Vue 3, Quasar and ECharts served from its own wheel)
- `load_page`, `loading`: the Load page and its job (the kit's own `load`, a background process, one at a time)
- `server`: the process `platforms.console` starts (`python -m ducklake_kit.console FOLDER`)
"""
