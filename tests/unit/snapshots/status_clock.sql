SELECT now() AS now_1
